"""The run application: what ``rlvr train`` / ``resume`` / ``sft`` / ``eval`` / ``runs`` do with a config, on the
loop library (``rlvr.rl``).

    import rlvr
    rlvr.train({"recipe": "arithmetic", "steps": 10})      # rlvr.app.run.train, through the package face

Its modules: ``settings`` (``TrainConfig``, YAML files and ``key=value`` overrides), ``recipes`` (the recipe
registry, one module per recipe), ``sources`` (a config's problem source), ``usage`` (``rlvr train --help``'s
recipes, losses and defaults), ``run`` (train / resume: warm-up, baseline, loop, final evaluation), ``sft``,
``evaluation``, ``status`` (``status.json`` and the clean stop around a run), ``progress`` and ``runs`` (the run
listing).

Not here: the loop and what it is made of (``rlvr.rl``), outside environments and APIs (``rlvr.integrations``).
"""
