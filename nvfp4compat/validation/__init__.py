"""``nvfp4compat validate``: the end-to-end checks in real vLLM engines on this machine's GPU.

``command`` parses the arguments and refuses in one line where the checks cannot run (no vLLM, no
CUDA GPU); ``runner`` runs one process per engine (``job``); ``checks`` turns the jobs' results
into each check's verdict; ``report`` writes ``summary.md`` and ``results.json``. Only ``job`` and
``runner`` need a GPU; the rest is plain Python, tested on the CPU.
"""
