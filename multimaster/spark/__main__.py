"""`python -m multimaster.spark verify -t FILE ...` (same command as `multimaster verify`)."""

from .cli import main

main()
