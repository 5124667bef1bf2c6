"""cudnn_cache (or python -m cudnn_cache): work with cache files the way you work with any other artefact.

    cudnn_cache inspect FILE              a table of every entry
    cudnn_cache validate FILE [FILE...]   check files; prints a summary of each
    cudnn_cache stats FILE                entries per GPU/cuDNN origin and cache, stored plans
    cudnn_cache diff A B                  entries only in A, only in B, and with another best
    cudnn_cache merge A B [...] -o OUT    one file of all; per candidate the faster measurement wins
    cudnn_cache export FILE --json [-o OUT]   the file as JSON (stdout without -o)
    cudnn_cache import [--json] JSON -o FILE  a cache file from a JSON export
    cudnn_cache synth FILE --entries N [--seed S]   a file of N synthetic entries (tests, benchmarks)
    cudnn_cache tune FILE [--max-seconds S] [--device D] [--jobs N]
                                          tune FILE's pending keys of this GPU and save them into it; with
                                          --jobs, in N worker processes spread over this GPU model's GPUs
    cudnn_cache run [--cache PATH] [--remote URL] [--no-intercept] train.py|-m MODULE [ARGS...]
                                          a script with the cache (python -m cudnn_cache.run)
    cudnn_cache remote stats URL          what a Redis store holds, per origin (cudnn_cache.remote)
    cudnn_cache remote push FILE URL      merge FILE's entries into the store, each on the server
    cudnn_cache remote pull URL -o FILE [--origin TAG...]   the store's entries as a cache file
    cudnn_cache remote prune URL (--origin TAG... | --other-versions)   delete entries from the store

Each command takes --help. Files are written atomically (temp file, fsync, rename); none of the file commands
touches a process's cache.
An export can be edited and imported again; the import makes the loader's checks (valid keys, ranked
candidates, known enum values). cereal writes each class's "cereal_class_version" once, in its first object:
leave it where it is.

Exit codes: 0 success (diff: the files hold the same entries and bests); 1 diff found differences; 2 usage
error; 3 a file is missing, unreadable, corrupt or not a cache file, or cannot be written (the reason is on
stderr, in one line); 4 tune found no CUDA GPU to time on; 5 the remote store cannot be reached, did not answer
within --timeout, or refused (the reason on stderr, in one line). run exits with the script's status.
"""

import argparse
import os
import sys
from typing import List, Optional

from . import _cli
from ._tune_jobs import jobs_argument, tune_file
from .remote import url_argument

EXIT_OK, EXIT_DIFFERENT, EXIT_USAGE, EXIT_BAD_FILE, EXIT_NO_GPU, EXIT_REMOTE = 0, 1, 2, 3, 4, 5


def _ops():
    import torch

    import cudnn_cache  # noqa: F401  (registers the ops)

    return torch.ops.cudnn_cache


def _inspect(args) -> int:
    print(_ops().file_table(args.file), end="")
    return EXIT_OK


def _validate(args) -> int:
    status = EXIT_OK
    for path in args.files:
        try:
            print(f"{path}: valid, {_ops().file_summary(path)}")
        except RuntimeError as error:
            print(f"{path}: invalid: {_reason(error)}", file=sys.stderr)
            status = EXIT_BAD_FILE
    return status


def _stats(args) -> int:
    print(_ops().file_statistics(args.file), end="")
    return EXIT_OK


def _diff(args) -> int:
    only_first, only_second, different, same = _ops().file_diff(args.first, args.second)
    for marker, lines in (("<", only_first), (">", only_second), ("!", different)):
        for line in lines:
            print(f"{marker} {line}")
    print(f"{len(only_first)} only in {args.first}, {len(only_second)} only in {args.second}, "
          f"{len(different)} with another best, {same} the same")
    return EXIT_DIFFERENT if only_first or only_second or different else EXIT_OK


def _merge(args) -> int:
    conflicts = _ops().file_merge(args.inputs, args.output)
    for line in conflicts:
        print(f"conflict: {line}")
    print(f"{args.output}: wrote {_ops().file_summary(args.output)}; {len(conflicts)} conflicts (the faster "
          "best was kept, the other as runner-up)")
    return EXIT_OK


def _export(args) -> int:
    text = _ops().file_export_json(args.file)
    if args.output is None:
        sys.stdout.write(text)
    else:
        _ops().file_write(args.output, text)
    return EXIT_OK


def _import(args) -> int:
    _ops().file_import_json(args.json, args.output)
    print(f"{args.output}: wrote {_ops().file_summary(args.output)}")
    return EXIT_OK


def _synth(args) -> int:
    written = _ops().file_synth(args.file, args.entries, args.seed)
    print(f"{args.file}: wrote {written} synthetic entries")
    return EXIT_OK


def _tune(args) -> int:
    import torch

    import cudnn_cache

    ops = _ops()
    summary = ops.file_summary(args.file)  # a missing or invalid file fails here, before any GPU work
    if not torch.cuda.is_available():
        print(f"{program()} tune: no CUDA GPU here to time {args.file}'s pending keys on; run it on a GPU of the "
              f"kind that met them ({summary})", file=sys.stderr)
        return EXIT_NO_GPU
    cudnn_cache.clear()
    report = tune_file(args.file, jobs=args.jobs, device=args.device, max_seconds=args.max_seconds)
    cudnn_cache.save(args.file)  # merged with the file: what another process saved meanwhile stays
    print(f"{args.file}: tuned {report['tuned']} pending keys of this GPU{_workers_text(report['workers'])}; "
          f"wrote {ops.file_summary(args.file)}")
    return EXIT_OK


def _workers_text(workers) -> str:
    """How tune's workers shared the keys, for its summary line; "" where it tuned in this process."""
    if not workers:
        return ""
    each = ", ".join(f"cuda:{worker['device']} {worker['tuned']} of {worker['keys']} keys ({worker['tunes']} "
                     "searches)" for worker in workers)
    return f" in {len(workers)} worker processes ({each})"


def _remote_command(args) -> int:
    """Runs a `remote` action: each takes the store and the arguments and returns its report, in words and as
    data (printed as JSON with --json)."""
    import dataclasses
    import json

    _ops()  # the ops the store's entries are checked with
    from . import remote

    text, report = args.action_run(remote.Remote(args.url, timeout=args.timeout), args)
    if dataclasses.is_dataclass(report):
        report = dataclasses.asdict(report)
    print(json.dumps(report, indent=1) if args.json else text)
    return EXIT_OK


def _remote_stats(store, args):
    held = store.stats()
    lines = [f"{held['url']}: format {held['format_version']}, {len(held['origins'])} origins"]
    for tag, origin in held["origins"].items():
        lines.append(f"  {tag}  {origin['entries']} entries, {origin['bytes']} bytes  {origin['origin']}")
    for version, keys in held["other_versions"].items():
        lines.append(f"  {keys} keys of format {version} (never read by this version; prune --other-versions)")
    return "\n".join(lines), held


def _remote_push(store, args):
    with open(args.file, "rb") as file:
        report = store.push(file.read(), args.file)
    return (f"{args.file} -> {store.name}: {report.entries} entries, {report.stored} stored, {report.unchanged} "
            f"unchanged, {report.replaced} replaced a damaged copy, {report.retries} merged again after another "
            f"writer, {report.seconds:.2f} s"), report


def _remote_pull(store, args):
    from .remote import _tensor

    data, report = store.pull(args.origin)
    _ops().file_write_checkpoint(args.output, _tensor(data))
    for name, reason in report.refused:
        print(f"left out {name}: {reason}", file=sys.stderr)
    return (f"{store.name} -> {args.output}: {report.entries} entries of {report.origins} origins, "
            f"{len(report.refused)} left out, {report.seconds:.2f} s; wrote {_ops().file_summary(args.output)}"), report


def _remote_prune(store, args):
    deleted = store.prune(args.origin, args.other_versions)
    return f"{store.name}: deleted {deleted} keys", {"url": store.name, "deleted": deleted}


def _origin_tag(text: str) -> str:
    """An argparse type: an origin's tag, 16 hex digits (remote stats lists them)."""
    if len(text) != 16 or any(c not in "0123456789abcdef" for c in text):
        raise argparse.ArgumentTypeError(f"takes an origin tag of 16 hex digits (remote stats lists them), not "
                                         f"{text!r}")
    return text


def _seconds(text: str) -> float:
    """An argparse type: a number of seconds >= 0."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"takes a number of seconds >= 0, not {text!r}")
    return value


SYNTHETIC_ENTRIES_LIMIT = 100_000  # kMaxSyntheticEntries in extension/include/cudnn_cache/synthetic.h
SEED_LIMIT = 10**18 - 1


def _count(limit: int):
    """An argparse type: a decimal integer from 0 to `limit`."""
    def parse(text: str) -> int:
        if not (text.isascii() and text.isdigit()) or len(text) > 18 or int(text) > limit:
            raise argparse.ArgumentTypeError(f"takes an integer from 0 to {limit}, not {text!r}")
        return int(text)
    return parse


def _reason(error: RuntimeError) -> str:
    """The first line of a RuntimeError from the ops, without the C++ frames PyTorch may append."""
    return str(error).splitlines()[0]


def program() -> str:
    """How the user called this: the console command `cudnn_cache` (pip install .) or python -m cudnn_cache."""
    return "cudnn_cache" if os.path.basename(sys.argv[0]) == "cudnn_cache" else "python -m cudnn_cache"


def parser(prog: str = "python -m cudnn_cache") -> argparse.ArgumentParser:
    main = _cli.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = main.add_subparsers(dest="command", required=True, metavar="COMMAND")

    command = commands.add_parser("inspect", help="a table of every entry")
    command.add_argument("file")
    command.set_defaults(run=_inspect)

    command = commands.add_parser("validate", help="check files; a summary of each")
    command.add_argument("files", nargs="+", metavar="file")
    command.set_defaults(run=_validate)

    command = commands.add_parser("stats", help="entries per origin and cache, and stored plans")
    command.add_argument("file")
    command.set_defaults(run=_stats)

    command = commands.add_parser("diff", help="entries only in one file, and entries with another best")
    command.add_argument("first")
    command.add_argument("second")
    command.set_defaults(run=_diff)

    command = commands.add_parser("merge", help="merge files into one; conflicts are reported")
    command.add_argument("inputs", nargs="+", metavar="input")
    command.add_argument("-o", "--output", required=True)
    command.set_defaults(run=_merge)

    command = commands.add_parser("export", help="a cache file as JSON")
    command.add_argument("file")
    command.add_argument("--json", action="store_true", required=True, help="the format (the only one)")
    command.add_argument("-o", "--output", help="the JSON file (default: stdout)")
    command.set_defaults(run=_export)

    command = commands.add_parser("import", help="a cache file from a JSON export")
    command.add_argument("json", metavar="JSON")
    command.add_argument("--json", dest="json_format", action="store_true",
                         help="the format (the only one, so optional; for symmetry with export --json)")
    command.add_argument("-o", "--output", required=True)
    command.set_defaults(run=_import)

    command = commands.add_parser("synth", help="a file of synthetic entries, for tests and benchmarks")
    command.add_argument("file")
    command.add_argument("--entries", type=_count(SYNTHETIC_ENTRIES_LIMIT), required=True, metavar="N")
    command.add_argument("--seed", type=_count(SEED_LIMIT), default=1, metavar="S",
                         help="the same seed gives the same entries (default 1)")
    command.set_defaults(run=_synth)

    command = commands.add_parser("tune", help="tune a file's pending keys of this GPU, into the file")
    command.add_argument("file")
    command.add_argument("--max-seconds", type=_seconds, default=None, metavar="S",
                         help="start no key after S seconds; the rest stay pending (default: tune them all)")
    command.add_argument("--device", type=_count(1023), default=None, metavar="D",
                         help="the CUDA device to tune on (default: the current one; with --jobs, every GPU of its "
                              "model)")
    command.add_argument("--jobs", type=jobs_argument, default=1, metavar="N",
                         help="tune in N worker processes, each 1/N of the keys, merging into FILE under its lock "
                              "(default 1: in this process)")
    command.set_defaults(run=_tune)

    command = commands.add_parser("remote", help="a shared store on Redis: stats, push, pull, prune")
    actions = command.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, run, help_text in (("stats", _remote_stats, "what the store holds, per origin"),
                                 ("push", _remote_push, "merge a file's entries into the store"),
                                 ("pull", _remote_pull, "the store's entries as a cache file"),
                                 ("prune", _remote_prune, "delete entries from the store")):
        action = actions.add_parser(name, help=help_text)
        if name == "push":
            action.add_argument("file")
        action.add_argument("url", metavar="URL", type=url_argument,
                            help="redis://[[user]:password@]host[:port][/db] or rediss://")
        if name == "pull":
            action.add_argument("-o", "--output", required=True)
            action.add_argument("--origin", nargs="+", type=_origin_tag, default=None, metavar="TAG",
                                help="only these origins (default: every origin; remote stats lists them)")
        if name == "prune":
            what = action.add_mutually_exclusive_group(required=True)
            what.add_argument("--origin", nargs="+", type=_origin_tag, metavar="TAG",
                              help="every entry of these origins (remote stats lists them)")
            what.add_argument("--other-versions", action="store_true",
                              help="every key of another version of the file format")
        action.add_argument("--timeout", type=_seconds, default=1.0, metavar="S",
                            help="seconds to connect and for each command (default 1)")
        action.add_argument("--json", action="store_true", help="the report as JSON")
        action.set_defaults(run=_remote_command, action_run=run)

    # Parsed by cudnn_cache.run itself (main() hands it everything after "run"); here for --help's list.
    commands.add_parser("run", add_help=False, help="run a script or module with the cache (--help: its options)")
    return main


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    prog = program()
    if argv[:1] == ["run"]:
        from . import run
        return run.main(argv[1:], prog=f"{prog} run")
    args = parser(prog).parse_args(argv)  # exits with 2 on a usage error
    try:
        return args.run(args)
    except RuntimeError as error:
        from .remote import RemoteError

        if isinstance(error, RemoteError):
            print(f"{prog} {args.command}: {error}", file=sys.stderr)
            return EXIT_REMOTE
        print(f"{prog} {args.command}: {_reason(error)}", file=sys.stderr)
        return EXIT_BAD_FILE
    except OSError as error:
        print(f"{prog} {args.command}: {error}", file=sys.stderr)
        return EXIT_BAD_FILE


if __name__ == "__main__":
    sys.exit(main())
