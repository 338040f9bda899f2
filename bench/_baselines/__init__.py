"""Baselines that ddpjob's trainer is measured against: plain scripts a team would write without it."""
