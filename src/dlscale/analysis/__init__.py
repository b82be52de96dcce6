"""Analysis over stored records: pure functions, no torch, never runs anything."""
