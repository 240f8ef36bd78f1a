"""The run: a scenario measured on a lab, case by case, into the store. `loop` is the Runner (a loop over the
schedule's rounds and sessions); `schedule` the plan, `conditions` what a case runs under, `case` one case,
`resume` a killed run continued, `context` what the parts share."""
