print("dispatch")
