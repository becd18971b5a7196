"""`quarry lab`: campaigns from a terminal (start, list, show, pause, resume, stop, direct, ledger, watch, plot).

One module per concept: `spec` (the campaign file and flags), `commands` (one handler per subcommand),
`view` (the live view and the ledger table), `plot` (the PNG).

The ledger and the plot read the campaign's ledger rows, each with the signals the campaign computed
after it (ListLedgerRows); `show` prints the signals now (GetCampaign). The live view folds the
campaign's events, computing the best so far with the kernel's signal rules, the campaign's own.
They need nothing but the supervisor's address.
"""
