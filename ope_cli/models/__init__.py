"""What an evaluation evaluates with, loaded or fitted and returned as values: ``policies``
(--policy values -> log_prob functions), ``behavior`` (where pi_b comes from),
``behavior_models`` (behavior models fitted to the logged actions: --behavior estimate,
ope fit-behavior), ``qfunctions`` (Q sources for dm, dr and wdr), ``q_models`` (fitted Q
evaluation models: ope fit-q) and ``fitted_q`` (--q fit)."""
