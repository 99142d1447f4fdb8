from mm_batch.cli import main

raise SystemExit(main())
