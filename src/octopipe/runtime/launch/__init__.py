"""Processes: spawned ranks or torchrun (`launcher`, `spawn`), each rank's tie to its launcher
(`lifeline`), and the settings refused before any rank starts (`preflight`). Measures no profile: no `measure`."""

MUST_NOT_IMPORT = ("measure",)
