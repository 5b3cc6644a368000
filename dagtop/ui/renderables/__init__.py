"""Plain functions and Rich renderables that draw snapshots: testable with a Rich Console, no App needed."""
