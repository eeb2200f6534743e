"""The launch plan and SGLang's memory budget, derived offline from the model's config.json.

One part per concern: ``plan`` (:func:`~deploytools.launch_plan.plan.build_plan`, the entry
point), ``model`` (what config.json says), ``common`` (flag tables, settings, overrides,
environment), ``engines`` (what each engine version needs, from ``engines.json``), ``sglang``
and ``rehearsal`` (each engine's plan), ``draft`` (the drafter), ``budget`` with ``shapes``
and ``pools`` (the memory budget), ``errors`` (:class:`~deploytools.launch_plan.errors.PlanError`,
every refusal). Data: ``flags/<engine>-<version>.json`` (each engine's parser, written by
``make engine-flags``) and ``engines.json``.

Standard library only. Ansible reaches it through filter_plugins/launch_plan.py, the tools
through tools/launch-plan, the tests as any package.
"""
