"""The exit statuses of an mmpe run, the same under every launcher.

A run stops by raising a :class:`RunStopped` subclass after it has logged
why. ``RunStopped`` is a ``SystemExit`` whose ``code`` is the status, so
with any launcher (mmpe's ``tools/train.py``, mmdet's or mmseg's
``tools/train.py`` and ``mim train``, which call ``runner.train()`` without
catching it) Python ends the process with that status and prints no
traceback; every rank raises it at the same point, so no rank is left
waiting in a collective.

=======  ==========================================================
status   meaning
=======  ==========================================================
0        done
2        bad input: the data set, the work dir, a checkpoint that
         ``--resume`` cannot load (nothing was trained)
75       preempted (``EX_TEMPFAIL`` of sysexits.h): a checkpoint of
         the last finished iteration was written; resume with
         ``--resume``
=======  ==========================================================
"""

#: Bad input: nothing was trained (``EX_USAGE``-like, as argparse uses).
BAD_INPUT_EXIT_CODE = 2

#: A preemption checkpoint was saved (``EX_TEMPFAIL`` of sysexits.h).
PREEMPTED_EXIT_CODE = 75


class RunStopped(SystemExit):
    """Ends the process with :attr:`status` (subclasses set it).

    Args:
        message (str): Why, already logged by the raiser; ``str()`` of the
            exception.
    """

    status = 1

    def __init__(self, message: str):
        super().__init__(self.status)  # SystemExit.code: the exit status
        self.message = message

    def __str__(self) -> str:
        return self.message


class BadInput(RunStopped):
    """The run cannot start on this input; status
    :data:`BAD_INPUT_EXIT_CODE`."""

    status = BAD_INPUT_EXIT_CODE
