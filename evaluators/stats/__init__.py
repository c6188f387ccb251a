"""Pure statistics: confidence sequences (`sequential`), paired estimates (`paired`) and the
session units they resample (`units`). Nothing here knows a PairSet."""
