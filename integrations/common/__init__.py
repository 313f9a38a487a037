"""What every stack's shim needs, written once: the switch (``switch``), the patch registry
(``patches``) and the start-up hooks with their ``.pth`` command (``startup``)."""
