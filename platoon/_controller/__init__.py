"""_controller"""
