#!/usr/bin/env python3
"""santhrottled with bridge mode's gate through the `nft` program. Runs INSIDE the guest.

    python3 daemon_nft_program.py --config FILE     # santhrottled's own arguments

closed_loop.py --bridge-check starts its "nft program" phases' daemon this way: the
gate as it ran before datapath/nftlib.py (every transaction `nsenter --net=NS nft -f
-`, every read `nft list`), beside the same daemon with the library, in one run. The
daemon is the product's; only nftlib.load() answers None, as it does on a host
without libnftables."""

from __future__ import annotations

import sys


def main() -> int:
    from santhrottle.appliance.daemon.main import main as daemon_main
    from santhrottle.appliance.datapath import nftlib

    nftlib.load = lambda netns: None  # no library: the nft program
    return daemon_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
