from distrec.cli import main

raise SystemExit(main())
