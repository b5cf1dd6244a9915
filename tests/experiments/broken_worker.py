"""Never runs: its controller fails first (tests the launcher's readiness check)."""
