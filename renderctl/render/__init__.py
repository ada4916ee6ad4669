"""Renderers: the code that turns a job's inputs and params into its output.

Only this package (and the worker that calls it) may import reportlab or pypdf; the specs in
``registry`` name their functions as ``"module:function"`` strings so that validating a
manifest or printing ``--help`` never imports them.
"""
