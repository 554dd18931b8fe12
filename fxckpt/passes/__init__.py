"""Graph passes: profile, tag, rewrite, rng, verify."""
