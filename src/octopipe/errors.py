"""Errors a user can cause. Each renders as one line; the CLI turns it into exit code 2."""


class OctoPipeError(Exception):
    """A fault in the user's input or request, reported as one line without a traceback."""


class InputError(OctoPipeError):
    """A file or argument is malformed: the message names the file, the place and the fault."""

    def __init__(self, where: str, message: str, place: str | None = None):
        self.where, self.place, self.message = where, place, message
        located = f"{where}: {place}" if place else where
        super().__init__(f"{located}: {message}")


class DeadlockError(OctoPipeError):
    """A schedule whose dependencies form a cycle; the message names the waiting actions."""


class MemoryExceededError(OctoPipeError):
    """No plan fits the devices' memory."""


class OctoPipeWarning(UserWarning):
    """Something the user should know that does not stop the command; the CLI prints it as
    one line (`octopipe run: warning: ...`)."""
