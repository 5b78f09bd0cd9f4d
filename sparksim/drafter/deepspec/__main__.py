"""`python -m sparksim.drafter.deepspec check|record …` (see `cli`)."""

from sparksim.drafter.deepspec.cli import main

raise SystemExit(main())
