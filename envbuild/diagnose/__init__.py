"""``envbuild diagnose``: why a training job leaves its GPU idle, measured on the job itself.

``probe`` is the in-process payload (standard library + torch, shipped whole as the job's
``sitecustomize.py``); ``procfs``, ``gpu`` and ``smi`` (nvidia-smi as one looping process)
read the samples; ``evidence`` sums them;
``verdict`` holds the rules (docs/diagnose.md); ``report`` writes JSON, text and HTML;
``session`` runs the job (or watches a pid) and samples it.
"""
