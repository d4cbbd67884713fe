from whale_lab.cli import main

raise SystemExit(main())
