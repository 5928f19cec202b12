"""Statistics: tests of counts against an exact law, the sample-size planner, seeded blocks and
shards (identical counts on any executor), and the efficiency verdict (SPEC §6, §15, §16)."""
