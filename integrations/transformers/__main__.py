"""``python -m detok_plugin.integrations.transformers``: manage the ``.pth`` hook."""

from . import _main

raise SystemExit(_main())
