"""An example Django project that uses weft_django (run it with ./scripts/demo)."""
