"""Running one scenario: card leases, the launchers, the rank body (worker) and the RunRecord it writes."""
