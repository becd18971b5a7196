"""The records a thread holds, one schema for every service and the command line that reads them.

`base` gives the one record base and its forward-compatibility policy; `research` the research
ledger's records; `campaign` a campaign's records; `signals` what is computed from a campaign's
ledger (noise floor, best, verdicts, stagnation, phase gate), pure, so the server and any reader
compute the same; `contract` a campaign's records and signals as quarry.v1 carries them.
"""
