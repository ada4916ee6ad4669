"""``SignalExit``: alone in its module, standard library only, so that the script's
entry point can import it before it sets its first signal handler (renderctl.errors costs
~10 ms of imports, a window in which a SIGTERM killed the process by the signal)."""


class SignalExit(SystemExit):
    """The exit a stop signal (SIGTERM, SIGINT, SIGHUP) asks of a command, raised by its
    handler: told apart from a plugin's own sys.exit() at import, which is that plugin's
    failure (review CP: a SIGTERM during a plugin's import was taken for one)."""
