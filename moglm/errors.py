"""The user-facing error type: the CLI prints it as one line (no traceback) and exits non-zero."""


class MoglmError(Exception):
    """Bad input from the user (files, configs, arguments): the message names the culprit."""


class TrainingInterrupted(MoglmError):
    """Ctrl-C or SIGTERM: a checkpoint was saved and the run can be resumed."""
