"""Reading a spec: the YAML read safely and within bounds (source, limits), its shape as
pydantic models (models), and the JSON schema editors use (schema). Nothing here checks
meaning; that is lowering's work."""
