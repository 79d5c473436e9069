from fabricd.cli import main

raise SystemExit(main())
