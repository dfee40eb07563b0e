"""The bottom layer: errors, the key normaliser, labels, threads, process-wide config, conversations.

Everything else imports these; they import nothing of ``outlines`` above
them (``tests/test_layers.py``). Users reach the public parts through
``outlines`` itself and the public faces ``outlines.errors`` and
``outlines.config``.
"""
