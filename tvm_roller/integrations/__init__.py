"""Integrations: thin adapters over the planner's front door (``tvm_roller.planner``).

``relax/`` (the Relax pipeline and its passes: whole models through ``tvm.compile``),
``dlight.py`` (a dlight ``ScheduleRule``), ``meta_schedule.py`` (roller's schedules as
MetaSchedule records), ``pytorch.py`` (PyTorch models into Relax). Each makes its
``planner.Context`` once and calls ``planner.schedule_function`` / ``plan_prepared``.
"""
