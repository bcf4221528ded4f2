print("dispatchd")
