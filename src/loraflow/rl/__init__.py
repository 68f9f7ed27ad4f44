"""What the RL stages need beyond the loop: rollouts, verifiable rewards, a trained reward model, the reference
policy."""
