"""The ramp's evidence: unpaired, anytime-valid comparisons of the candidate's sessions against
production's while a share of new sessions is served by the candidate. `arms` (per-session
units from requests) -> `twosample` (confidence sequences of the difference) -> `step`
(advance / rollback / wait, and each step's expected duration). Pure: no IO."""
