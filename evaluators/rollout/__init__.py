"""The rollout's evidence: unpaired, anytime-valid comparisons of the candidate's sessions against
production's while a share of new sessions is served by the candidate. `arms` (per-session
units from requests) -> `twosample` (confidence sequences of the difference) -> `rule` (the
ramp's decision at each look: deterioration tests, power-sized dwells, one non-inferiority
look; and a ramp's expected time) ; `step` (the round-4 step judgement and `step_duration`,
each step's time to show its margins); `guards` (how often the workers' guards trip on a
candidate equal to production, within the rollout's error budget). Pure: no IO."""
