raise ImportError("deliberately broken controller script")
