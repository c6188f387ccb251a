"""Pure statistics: confidence sequences (`sequential`) and paired estimates (`paired`).
Nothing here knows a PairSet."""
