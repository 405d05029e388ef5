"""The pure core: versions, policies, planner, table specs. Standard library only."""
