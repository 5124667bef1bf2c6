"""What the command lines share (python -m cudnn_cache, the `cudnn_cache` command, python -m cudnn_cache.run)."""

import argparse


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, with a usage error in one line on stderr that points at --help (exit status 2), not
    the usage text followed by the error; its subcommands' parsers are of this kind too."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")
