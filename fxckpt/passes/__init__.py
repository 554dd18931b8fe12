"""Graph passes: cse and dropout (the joint graph made ready to plan),
profile, tag, rewrite (with rng), verify."""
