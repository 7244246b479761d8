"""loopir: tensor expressions, the affine loop IR, and its analysis."""
