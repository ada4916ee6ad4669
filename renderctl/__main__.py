"""``python -m renderctl``: the command line, exactly as the ``renderctl`` script runs it.

For a virtualenv whose scripts folder is not on PATH, and for ``python -m`` habits. It
imports only the CLI module: the renderers (reportlab, pypdf) load inside the commands
that need them, so ``--help`` starts as fast as the script does.
"""

from renderctl.cli.launch import main

if __name__ == "__main__":
    main()  # exits with the command's code itself (click's standalone mode, or sys.exit)
