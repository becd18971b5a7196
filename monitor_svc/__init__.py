"""MonitorService: observation of compute at zero model cost."""

import warnings

# asyncssh names cryptography's DSA types, which cryptography deprecates loudly on import: eight lines of
# warnings on every monitor's start, about a key type the monitor never offers.
warnings.filterwarnings("ignore", message="DSA is deprecated", module=r"asyncssh\.")
