"""The workloads' hooks (:mod:`moglm.registry`): how each kind of job runs inside an experiment, what its
tuning problem is and how its best trial is reported. The registry names these functions; nothing imports
this package directly except through it."""
