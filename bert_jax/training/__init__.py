"""Training machinery: mesh and sharding rules, optimizer, train state and step."""
