"""`python -m multimaster.cli ...`: the `multimaster` command without its console script (as
`python -m multimaster.spark verify` was before the CLI became one package)."""

from multimaster.cli import main

main()
