"""Long tests: train to a target accuracy (time to accuracy), LR schedules, LARS, MLPerf logs, resume."""
