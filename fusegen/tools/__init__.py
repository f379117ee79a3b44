"""The GPU commands: bench (and its suite), tune, inspect, and the timers they share."""
