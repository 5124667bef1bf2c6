"""python -m cudnn_cache.run: runs an unmodified training script with the persisted cache.

    python -m cudnn_cache.run [--cache PATH] [--remote URL] [--no-intercept] train.py [ARGS...]
    python -m cudnn_cache.run [--cache PATH] [--remote URL] [--no-intercept] -m package.module [ARGS...]

The cache file loads before the script starts and is saved when the process exits, as CUDNN_CACHE_PATH does
(--cache sets it; without --cache and without the variable, the default directory
$XDG_CACHE_HOME/cudnn_cache with one file per GPU and cuDNN identity). PyTorch's own CUDA convolutions run
through the cache (cudnn_cache.intercept) unless --no-intercept. The script sees its own sys.argv and runs as
__main__; its exit status is this command's. CUDNN_CACHE_INTERCEPT=0 has the effect of --no-intercept.
--remote URL layers a Redis store under the file, as CUDNN_CACHE_REMOTE does (cudnn_cache.set_remote).
"""

import argparse
import importlib.util
import os
import runpy
import sys
from typing import List, Optional

from . import _cli
from .remote import url_argument


def _module_problem(name: str) -> Optional[str]:
    """Why `python -m name` could not start, as runpy would find it, or None. Finding a submodule imports its
    packages, as running it would."""
    try:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations is not None:  # a package runs its __main__
            if importlib.util.find_spec(f"{name}.__main__") is None:
                return f"{name} is a package without a __main__ module; it cannot be run"
    except (ImportError, ValueError) as error:
        return f"cannot find module {name}: {error}"
    return None if spec is not None else f"no module named {name}"


def parse_args(argv: Optional[List[str]], prog: str = "python -m cudnn_cache.run") -> argparse.Namespace:
    """The runner's own options, then the script (or -m MODULE) and everything after it, which is the
    script's: its options are never read as the runner's."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = _cli.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    parser.add_argument("--cache", metavar="PATH",
                        help="the cache file or directory (default: $CUDNN_CACHE_PATH, else 'default')")
    parser.add_argument("--remote", metavar="URL", type=url_argument,
                        help="a Redis store shared by many machines, under the file (default: $CUDNN_CACHE_REMOTE)")
    parser.add_argument("--no-intercept", action="store_true",
                        help="leave PyTorch's convolutions alone: only converted models use the cache")
    parser.add_argument("-m", dest="module", metavar="MODULE", help="run a module as a script, like python -m")
    parser.add_argument("script", nargs="?", help="the script to run, followed by its arguments")
    own, rest, index = [], [], 0
    while index < len(argv):
        item = argv[index]
        if item in ("--cache", "--remote", "-m") and index + 1 < len(argv):
            own += argv[index:index + 2]
            index += 2
            if item == "-m":
                rest = argv[index:]
                break
        elif item.startswith("-"):
            own.append(item)
            index += 1
        else:
            own.append(item)
            rest = argv[index + 1:]
            break
    args = parser.parse_args(own)
    if args.module is None and args.script is None:
        parser.error("name a script to run (train.py ...) or a module (-m package.module ...)")
    if args.module is not None and args.script is not None:
        parser.error("give a script or -m MODULE, not both")
    if args.script is not None and not os.path.exists(args.script):
        parser.error(f"no such script: {args.script}")
    if args.script is not None and not os.path.isfile(args.script):
        parser.error(f"{args.script} is not a file; name a Python script")
    if args.module is not None and (problem := _module_problem(args.module)) is not None:
        parser.error(problem)
    if args.cache == "":
        parser.error("--cache needs a file, a directory or 'default'")
    args.arguments = rest
    return args


def main(argv: Optional[List[str]] = None, prog: str = "python -m cudnn_cache.run") -> int:
    args = parse_args(argv, prog)
    import cudnn_cache
    from cudnn_cache import _activation, _environment

    intercepting = not args.no_intercept and _environment.intercept()  # refused before anything is loaded
    if args.remote is not None:
        cudnn_cache.set_remote(args.remote)
        os.environ[_environment.REMOTE] = args.remote  # and the script's child processes
        if cudnn_cache.active_file() is not None:  # the import loaded the file before the remote was known
            cudnn_cache.pull_remote()
    value = args.cache or os.environ.get(_activation.ENVIRONMENT) or _activation.DEFAULT
    os.environ[_activation.ENVIRONMENT] = value  # child processes of the script use the same cache
    if cudnn_cache.active_file() is None:  # the import did not activate it (the variable was not set)
        _activation.activate(value)
    cudnn_cache.intercept(intercepting)
    if not intercepting:
        os.environ[cudnn_cache.INTERCEPT_ENVIRONMENT] = "0"
    cudnn_cache.logger.info("cudnn_cache.run: cache %s, intercepting %s", cudnn_cache.active_file(),
                            cudnn_cache.intercepting())
    if args.module is not None:
        sys.argv = [args.module, *args.arguments]
        runpy.run_module(args.module, run_name="__main__", alter_sys=True)
    else:
        sys.argv = [args.script, *args.arguments]
        sys.path.insert(0, os.path.dirname(os.path.abspath(args.script)))
        runpy.run_path(args.script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
