from fusegen.cli import main

raise SystemExit(main())
