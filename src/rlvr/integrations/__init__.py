"""Outside environments and APIs on the loop library: textarena games (``textarena``), verifiers 0.3 environments
(``verifiers_env``) and 0.4 v1 tasksets (``verifiers_v1``, with rlvr's chat harness in ``verifiers_v1_harness``),
multi-turn code refinement (``refine``) and the TenSafe cookbook's API (``tensafe``). Each needs its own extra
(``rlvr[textarena]``, ``rlvr[verifiers]``) where it wraps another package; import the module you use.

Not here: the loop (``rlvr.rl``) and the run application (``rlvr.app``) that these plug into.
"""
