"""Starts the Rust router of an installed vllm-router (or sglang-router) package: its own
argument parser and Router, without the package's launch_router module, which imports its Python
mini load balancer (fastapi, aiohttp: not installed, see router-requirements.txt).

Usage: python router_launch.py [vllm_router|sglang_router] ROUTER ARGS... (the package's
launch_router flags: --host, --port, --worker-urls, --policy, ...). Blocks until killed.
"""
import argparse
import importlib
import sys


def main(argv):
    package = argv[0] if argv and argv[0] in ("vllm_router", "sglang_router") else "vllm_router"
    if argv and argv[0] == package:
        argv = argv[1:]
    router_args = importlib.import_module(package + ".router_args").RouterArgs
    router = importlib.import_module(package + ".router").Router
    parser = argparse.ArgumentParser(prog=package)
    router_args.add_cli_args(parser, use_router_prefix=False)
    args = router_args.from_cli_args(parser.parse_args(argv), use_router_prefix=False)
    args._validate_router_args()
    router.from_args(args).start()


if __name__ == "__main__":
    main(sys.argv[1:])
