"""The RL layer: environments, rollouts, advantages and training loops, driving only the client API."""
