"""``python -m detok_plugin.integrations.tgi``: manage the ``.pth`` hook, or check TGI's contract."""

from . import _main

raise SystemExit(_main())
